"""The machinery the steps share, below them: process pools (:mod:`.pool`, :mod:`.workers`), the ranks
of a ``torchrun`` run (:mod:`.ranks`), the shard merge (:mod:`.merge`), where a step writes
(:mod:`.stream_output`: standard output, a file, a resumable file or a rank's shard, over
:mod:`.resumable`'s partial file) and parameter checks (:mod:`.params`). Nothing here knows a step or a
plugin: it imports only the layers below it (format, core, io, errors; tests/test_layers.py checks that)."""
