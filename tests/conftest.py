"""Shared test configuration: fixtures come from fireflyer.testing plugins."""

pytest_plugins = [
    "fireflyer.testing.fixtures",
    "fireflyer.testing.hangs",
    "fireflyer.testing.service_report",
]
