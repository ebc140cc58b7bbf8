"""The soft-RoCE VM harness: ``launch`` (host side), ``guest.sh`` and ``provision.sh`` (inside)."""
