"""``haiscale``: the name HAI Platform's training scripts import; a shim over :mod:`fireflyer.haiscale`.

``import haiscale.ddp`` gives ``haiscale.ddp.DistributedDataParallel``; importing this
package also registers the ``hfreduce`` torch.distributed backend, as
``import fireflyer.haiscale`` does.
"""

from __future__ import annotations

import fireflyer.haiscale  # noqa: F401  (registers the torch.distributed backend)
