"""ToolSpec inside vLLM: the drafter as a vLLM speculative method.

``request`` (what a request carries to vLLM's worker), ``sessions`` (the drafters of running
requests, from tokens; no vLLM import), ``proposer`` (the class vLLM loads and the worker
extension that attaches it). Importing this package imports no vLLM.
"""
