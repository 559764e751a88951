# Nothing is reachable from 0.0.0.0/0. Rules are separate resources, so the broker and
# ZooKeeper groups can name each other without a dependency cycle.

resource "aws_security_group" "broker" {
  name        = "${var.name}-broker"
  description = "Riverbed brokers: Kafka protocol from the VPC and allowed_cidrs, metrics from the VPC"
  vpc_id      = aws_vpc.main.id

  tags = { Name = "${var.name}-broker" }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "zookeeper" {
  name        = "${var.name}-zookeeper"
  description = "ZooKeeper ensemble: client port from brokers and ZooKeeper, peer ports from ZooKeeper"
  vpc_id      = aws_vpc.main.id

  tags = { Name = "${var.name}-zookeeper" }

  lifecycle {
    create_before_destroy = true
  }
}

# --- brokers: ingress -------------------------------------------------------------------------

# Clients and the other brokers (replication) are all inside the VPC; allowed_cidrs adds peered
# networks. The variable's validation refuses /0.
resource "aws_vpc_security_group_ingress_rule" "broker_kafka" {
  for_each = toset(concat([var.vpc_cidr], var.allowed_cidrs))

  security_group_id = aws_security_group.broker.id
  description       = "Kafka protocol (plaintext) from ${each.value}"
  ip_protocol       = "tcp"
  from_port         = local.broker_port
  to_port           = local.broker_port
  cidr_ipv4         = each.value
}

resource "aws_vpc_security_group_ingress_rule" "broker_metrics" {
  security_group_id = aws_security_group.broker.id
  description       = "Metrics exporter (9308) from the VPC"
  ip_protocol       = "tcp"
  from_port         = local.metrics_port
  to_port           = local.metrics_port
  cidr_ipv4         = var.vpc_cidr
}

# --- brokers: egress --------------------------------------------------------------------------

resource "aws_vpc_security_group_egress_rule" "broker_to_broker" {
  security_group_id            = aws_security_group.broker.id
  description                  = "Replication: fetches from the other brokers"
  ip_protocol                  = "tcp"
  from_port                    = local.broker_port
  to_port                      = local.broker_port
  referenced_security_group_id = aws_security_group.broker.id
}

resource "aws_vpc_security_group_egress_rule" "broker_to_zookeeper" {
  security_group_id            = aws_security_group.broker.id
  description                  = "ZooKeeper client connections"
  ip_protocol                  = "tcp"
  from_port                    = local.zookeeper_client_port
  to_port                      = local.zookeeper_client_port
  referenced_security_group_id = aws_security_group.zookeeper.id
}

resource "aws_vpc_security_group_egress_rule" "broker_to_s3" {
  security_group_id = aws_security_group.broker.id
  description       = "Cold tier: S3 over HTTPS through the gateway endpoint"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  prefix_list_id    = aws_vpc_endpoint.s3.prefix_list_id
}

# Package downloads at boot (apt over HTTP with signed indexes, PyPI over HTTPS) through the NAT
# gateways. With an AMI that has everything baked in these two rules can go (docs/terraform.md).
resource "aws_vpc_security_group_egress_rule" "broker_https" {
  security_group_id = aws_security_group.broker.id
  description       = "HTTPS for PyPI and Debian at boot (through NAT)"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = "0.0.0.0/0"
}

resource "aws_vpc_security_group_egress_rule" "broker_http" {
  security_group_id = aws_security_group.broker.id
  description       = "HTTP for Debian's signed package archive at boot (through NAT)"
  ip_protocol       = "tcp"
  from_port         = 80
  to_port           = 80
  cidr_ipv4         = "0.0.0.0/0"
}

# --- ZooKeeper: ingress -----------------------------------------------------------------------

resource "aws_vpc_security_group_ingress_rule" "zookeeper_client_from_brokers" {
  security_group_id            = aws_security_group.zookeeper.id
  description                  = "ZooKeeper client port from the brokers"
  ip_protocol                  = "tcp"
  from_port                    = local.zookeeper_client_port
  to_port                      = local.zookeeper_client_port
  referenced_security_group_id = aws_security_group.broker.id
}

resource "aws_vpc_security_group_ingress_rule" "zookeeper_client_from_zookeeper" {
  security_group_id            = aws_security_group.zookeeper.id
  description                  = "ZooKeeper client port from the ensemble (zkCli on a node)"
  ip_protocol                  = "tcp"
  from_port                    = local.zookeeper_client_port
  to_port                      = local.zookeeper_client_port
  referenced_security_group_id = aws_security_group.zookeeper.id
}

resource "aws_vpc_security_group_ingress_rule" "zookeeper_peer" {
  security_group_id            = aws_security_group.zookeeper.id
  description                  = "ZooKeeper quorum (follower to leader) port from the ensemble"
  ip_protocol                  = "tcp"
  from_port                    = local.zookeeper_peer_port
  to_port                      = local.zookeeper_peer_port
  referenced_security_group_id = aws_security_group.zookeeper.id
}

resource "aws_vpc_security_group_ingress_rule" "zookeeper_election" {
  security_group_id            = aws_security_group.zookeeper.id
  description                  = "ZooKeeper leader election port from the ensemble"
  ip_protocol                  = "tcp"
  from_port                    = local.zookeeper_leader_port
  to_port                      = local.zookeeper_leader_port
  referenced_security_group_id = aws_security_group.zookeeper.id
}

# --- ZooKeeper: egress ------------------------------------------------------------------------

resource "aws_vpc_security_group_egress_rule" "zookeeper_ensemble" {
  for_each = toset([tostring(local.zookeeper_client_port), tostring(local.zookeeper_peer_port), tostring(local.zookeeper_leader_port)])

  security_group_id            = aws_security_group.zookeeper.id
  description                  = "ZooKeeper port ${each.value} to the ensemble"
  ip_protocol                  = "tcp"
  from_port                    = tonumber(each.value)
  to_port                      = tonumber(each.value)
  referenced_security_group_id = aws_security_group.zookeeper.id
}

resource "aws_vpc_security_group_egress_rule" "zookeeper_https" {
  security_group_id = aws_security_group.zookeeper.id
  description       = "HTTPS for Debian packages at boot (through NAT)"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = "0.0.0.0/0"
}

resource "aws_vpc_security_group_egress_rule" "zookeeper_http" {
  security_group_id = aws_security_group.zookeeper.id
  description       = "HTTP for Debian's signed package archive at boot (through NAT)"
  ip_protocol       = "tcp"
  from_port         = 80
  to_port           = 80
  cidr_ipv4         = "0.0.0.0/0"
}
