"""Data path: the native protocol codec, topic algebra and the per-message machinery below channels.

Everything else in topicwire stands on this package; it imports nothing from the others.
Importing it points numba's cache at the directory of the current kernel sources
(``datapath.jit``), before any kernel module is compiled or loaded.
"""

from datapath import jit as _jit

_jit.configure()
