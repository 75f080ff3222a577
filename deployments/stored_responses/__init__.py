"""Stored responses of the Responses API: ``service``, the one deployment every ingress replica
reaches, owns ``store``, the LMDB environment that holds them."""
