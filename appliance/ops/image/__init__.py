"""Bootable appliance disk images: ``build`` makes one, ``boot`` runs it under QEMU
(docs/images.md)."""
