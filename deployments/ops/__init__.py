"""What every process shares to be operated: ``metrics`` (Prometheus through Ray), ``tracing``
(OpenTelemetry spans), ``names`` (the deployments' names, for ``/health``), ``ready`` (the
command that waits until a deployed app answers)."""
