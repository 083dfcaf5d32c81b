"""Facts about this machine: GPUs, MIG devices, driver files, and safe access to a rootfs.

Owns: discovery of GPUs and driver files (``discovery``, ``devices``, ``mig``); NVML and
the facts only it knows, with the ``nvml-facts`` file for nodes NVML cannot describe
(``nvml``); the ELF and ``ld.so.cache`` codecs (``elf``, ``ldcache``); file access confined
to a container rootfs (``inroot``); CUDA forward compatibility (``cudacompat``); device
node creation (``system``); and the simulated GPU node tests and demos run on (``sim``:
build and load; ``simnode``: its records, plan and file writers; ``simkernel``: device
nodes and procfs; ``simdriver``: libraries, programs, firmware, sockets).

May import only the base modules (``errors``, ``_record``, ``_jsonc``, ``files``,
``config``, ``edits``). Production modules never read what only the simulator writes.
This file stays empty: every GPU create imports it.
"""
