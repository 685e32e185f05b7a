"""KVzap-Linear and KVzap-MLP surrogates: the model, its checkpoints and their loading (library).

`from kvzap.surrogate import Surrogate` works; the class is imported on first use, so that the torch-free planner can
read `kvzap.surrogate.settings` without importing torch."""


def __getattr__(name: str):
    if name == "Surrogate":
        from kvzap.surrogate.model import Surrogate

        return Surrogate
    raise AttributeError(f"module 'kvzap.surrogate' has no attribute {name!r}")
