"""Request handlers: one module per Kafka API, each turning a decoded request into a response.

Handlers never see sockets or bytes on the wire (the server and the codec do that); they read the
broker's state through `BrokerContext` and map every failure to a Kafka error code, once.
"""
