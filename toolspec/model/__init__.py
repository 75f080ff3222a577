"""The target model: where weights come from (``packages``), how they load (``loading``), the
kernels they run with (``packed_linear``, ``attention``), the forward the loop calls
(``target_model``, ``tensor_parallel``), and what a forward costs on this machine
(``cost_curve``, ``machine``). Implements ``toolspec.core.forward``; imports core and calls."""
