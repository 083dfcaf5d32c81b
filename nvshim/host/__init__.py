"""Facts about this machine: GPUs, MIG devices, driver files, and safe access to a rootfs.

Owns: discovery of GPUs and driver files (``discovery``, the seam, joining ``roots``,
``gpus``, ``driverfiles`` and ``versions``; ``devices``, ``mig``); NVML and
the facts only it knows, with the ``nvml-facts`` file for nodes NVML cannot describe
(``nvml``); the ELF and ``ld.so.cache`` codecs (``elf``, ``ldcache``); file access confined
to a container rootfs (``inroot``); CUDA forward compatibility (``cudacompat``); device
node creation (``system``). The simulated GPU node tests and demos run on is not here: it
is :mod:`nvshim.sim`, which builds on these modules and which none of them imports.

May import only the base modules (``errors``, ``_record``, ``_jsonc``, ``files``,
``config``, ``edits``). Production modules never read what only the simulator writes.
This file stays empty: every GPU create imports it.
"""
