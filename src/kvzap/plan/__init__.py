"""The plan of a run, from its config, torch-free (Snakemake imports it at parse time; tests call it directly):

  schema    the JSON schema's verdict as one message (config.schema.json ships inside the package)
  checks    every check a schema cannot express, before any job
  sweep     the evaluation cells a config asks for
  paths     where every output lives: the rules' templates and the command lines both read them
  inputs    the files each rule reads
  commands  the argument lists of the rules' commands
  jobs      an evaluation job's typed spec, what its rule hands the job
  cluster   the cluster resources of each stage's jobs
`python -m kvzap.plan CONFIG` runs the checks without Snakemake.

Config values are data: every string that becomes part of a path matches a strict pattern and is checked again
here; every value that reaches a command line goes through `shlex.join`; every bad value is refused before the first
job with its key path, the value and the fix (kvzap.plan.errors).
"""
