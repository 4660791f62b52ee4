"""The machinery the steps share, below them: process pools (:mod:`.pool`, :mod:`.workers`), the ranks
of a ``torchrun`` run (:mod:`.ranks`), the shard merge (:mod:`.merge`), resumable stream output
(:mod:`.resumable`) and parameter checks (:mod:`.params`). Nothing here knows a step or a plugin: it
imports only the layers below it (format, core, io, errors; tests/test_layers.py checks that)."""
