"""autoopt: make PyTorch training fast with the least change to the user's code.

model, loader, optimizer = autoopt.optimize(model, loader, optimizer)
"""

from autoopt.runtime.optimize import optimize, report, unwrap
from autoopt.runtime.seed import seed_everything

__version__ = "0.1.0"
__all__ = ["optimize", "report", "unwrap", "seed_everything", "__version__"]
