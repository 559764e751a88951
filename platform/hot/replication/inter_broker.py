"""This broker's connections to other brokers: on `inter.broker.listener.name`, with that
listener's TLS and SASL (the broker's own credentials from `sasl.jaas.config`).

Replica fetchers and controlled shutdown dial through one `InterBrokerDialer`, so the listener
and its security are decided once, when the broker starts.
"""

from __future__ import annotations

from riverbed.client.connection import BrokerConnection
from riverbed.configs import BrokerConfig
from riverbed.coordination.metadata_cache import MetadataCache
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.security.client import (
    PLAINTEXT,
    ConnectionSecurity,
    SaslCredentials,
    connection_security,
)


class InterBrokerDialer:
    def __init__(
        self, cache: MetadataCache, listener: str, security: ConnectionSecurity = PLAINTEXT
    ) -> None:
        self._cache = cache
        self.listener = listener
        self.security = security

    @classmethod
    def from_config(cls, config: BrokerConfig, cache: MetadataCache) -> InterBrokerDialer:
        """Reads the TLS files now: a bad truststore is a start-up error, not a stuck fetcher."""
        listeners = config.listener_set
        protocol = listeners.advertised_by_name(listeners.inter_broker).protocol
        sasl = None
        if protocol.uses_sasl:
            credentials = config.inter_broker_credentials
            sasl = SaslCredentials(
                config.sasl_mechanism_inter_broker_protocol,
                credentials.username,
                credentials.password,
            )
        security = connection_security(
            protocol,
            config.tls_files,
            check_hostname=config.ssl_endpoint_identification_algorithm == "https",
            sasl=sasl,
        )
        return cls(cache, listeners.inter_broker, security)

    async def open(self, broker_id: int, *, client_id: str, timeout_ms: int) -> BrokerConnection:
        """A negotiated (and authenticated) connection to broker `broker_id`."""
        registration = self._cache.broker(broker_id)
        if registration is None:
            raise KafkaError(
                ErrorCode.BROKER_NOT_AVAILABLE, f"broker {broker_id} is not registered"
            )
        endpoint = registration.endpoint(self.listener)
        if endpoint is None:
            raise KafkaError(
                ErrorCode.BROKER_NOT_AVAILABLE,
                f"broker {broker_id} has no {self.listener} listener (inter.broker.listener.name)",
            )
        host, port = endpoint
        return await BrokerConnection.open(
            host, port, client_id=client_id, timeout_ms=timeout_ms, security=self.security
        )
