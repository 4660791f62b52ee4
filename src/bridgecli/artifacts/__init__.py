"""The files and folders the steps hand to each other, each with one owner: its layout, its typed
metadata (msgspec structs; files written by earlier versions still read), one writer and one reader.

- :mod:`.warmup_run`: the folder ``bridge warmup`` writes and ``score``/``analyze``/``reference``
  read (checkpoint, ``warmup.json``, metrics), and the rule that leaves the warmup's ids out of the
  data scored or analysed.
- :mod:`.direction_file`: ``direction.safetensors``, the scoring direction v and its metadata.
- :mod:`.rows_meta`: the side file ``bridge compact`` writes next to its rows and ``bridge train`` reads.
- :mod:`.train_run`: the folder ``bridge train`` writes (summary, metrics, checkpoints, the model).
- :mod:`.json_file`: the one reader of their JSON files, each into its struct.

This package imports no torch at import time.
"""
