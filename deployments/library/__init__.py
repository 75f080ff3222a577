"""The shared call library as serving runs it.

``service``: the retrieval actors, the processes that own the sharded LMDB library. In each
model replica: ``cache``, the replica's local view filled ahead of use, and ``decode_lookups``,
the lookups that follow what a request's output reveals.
"""
