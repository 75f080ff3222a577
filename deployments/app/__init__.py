"""The application: the config models and ``builder.build_app``, the one place that sees
every part (the ingress, the replicas, the library, the stored responses, the router)."""
