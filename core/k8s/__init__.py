"""Berth as Kubernetes' node agent (issue 39): the first pieces.

- :mod:`berth.k8s.objects`: read ResourceClaims and ResourceSlices as the API serves them
  (JSON or YAML, one object, several, or a List) into the ``kubernetes`` client's own models.
- :mod:`berth.k8s.claims`: an allocated ResourceClaim (``resource.k8s.io/v1``) as lease
  requests: one share per card, sized by the allocation's ``consumedCapacity.memory``.
- :mod:`berth.k8s.slices`: the ResourceSlice Berth would publish for this node's cards.
- :mod:`berth.k8s.cli`: ``berth k8s lease`` and ``berth k8s slices``.

The design, and what is not built yet, is docs/scale.md. Everything here needs the optional
extra ``berth-gpu[k8s]`` (the ``kubernetes`` client); without it the commands say so in one line.
"""
