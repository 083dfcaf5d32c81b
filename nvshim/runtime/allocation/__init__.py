"""require-allocation: what runs only when a create must prove a claim was allocated.

Owns: ``policy`` (ask the kubelet when the config says to, read the pod sandbox's
annotations, refuse any granted GPU, MIG device or IMEX channel the kubelet's record
lacks), and ``kubelet`` (its PodResources API and its device checkpoint; the protobuf wire format
of its messages is :mod:`nvshim._protobuf`).

A create imports this package only under ``require-allocation`` when the kubelet is to be
asked or an annotation claim must be told apart from the pod's own annotations; an
ordinary create never loads it. May import what :mod:`nvshim.runtime` may, and the rest of
:mod:`nvshim.runtime`. This file stays empty: importing a module here imports it first.
"""
