"""The HAI Platform scheduler service (``python -m services.scheduler``): tasks, nodes, quotas."""
