"""Which training settings each surrogate kind depends on, torch-free: the planner reruns a surrogate only when
one of its own settings changes, and the trainer refuses a run that lacks one."""

TRAINING_KEYS = {"linear": ("alpha",), "mlp": ("epochs", "lr", "batch_size", "valid_split", "keep")}
KINDS = tuple(TRAINING_KEYS)  # the surrogate kinds: KVzap-Linear and KVzap-MLP
