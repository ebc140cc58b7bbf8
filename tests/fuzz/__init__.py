"""Fuzzing: nothing a peer sends can end an appliance, and every frame is counted.

A mutation fuzzer in plain Python (``make fuzz``; docs/appliance.md, "Fuzzing"):

    python -m tests.fuzz live --seconds N [--port-kinds client,fabric] [--seed S] [--json]
    python -m tests.fuzz decoders --seconds N [--targets decode_frame,...] [--seed S] [--json]

- ``seeds.py``: what the mutations start from: the golden vectors, a frame of every type and
  a CONTROL entry of every kind built with the codec, frames the neighbour signs with the
  fabric key, documents of the wrong shape, configs, a registry file, a capture;
- ``mutate.py``: bit flips, boundary bytes, length and count fields set to 0, their maximum
  or one off, truncation, extension, duplication and splicing of frames, mutated JSON
  documents framed correctly (so they reach their schema);
- ``live.py``: one appliance in this process, its client and fabric ports fuzzed in turn from
  an anonymous client, a logged-in session, the configured neighbour (admin frames signed
  again after mutation) and a stranger; then: is it running, does a real client still get
  its message, is every frame counted under a reason (``accounting``);
- ``decoders.py``: each decoder in process (the codec, the batch decoder and the software NIC
  against it, CONTROL documents, configs, registry files, captures): it returns or raises its
  documented error, nothing else;
- ``corpus/`` and ``test_corpus.py``: inputs that crashed something, saved by the fuzzer
  (``corpus.py``), replayed by ``make test``.

Both commands print a JSON summary and exit 1 on a crash, an unexpected exception or a frame
not accounted for. Runs are reproducible from ``--seed`` (printed in the summary), up to the
timing of the appliance's threads.
"""
