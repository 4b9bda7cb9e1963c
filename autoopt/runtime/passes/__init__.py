"""The runtime passes, one module each, in the order `optimize()` runs them.

Each module defines `run(ctx: Context) -> PassResult | None`. Adding a pass means adding a module
here and naming it in PASSES; later passes read what earlier ones decided from the context."""

from autoopt.runtime.passes import (
    accumulate,
    amp,
    backends,
    channels_last,
    checkpoint,
    compile,
    device,
    distributed,
    loader,
)

PASSES = (
    distributed.run,  # first: fixes the device (LOCAL_RANK) and registers the DDP wrap finalizer
    device.run,
    backends.run,
    checkpoint.run,
    channels_last.run,
    amp.run,
    accumulate.run,  # after amp: its step gate wraps the loss scaler's step
    compile.run,
    loader.run,  # last: needs the device, channels-last choice and distributed state
)
