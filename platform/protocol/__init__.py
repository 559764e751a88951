"""Sans-IO Kafka wire protocol: frames, headers, schema-driven messages and record batches."""
