# A 3-node ZooKeeper ensemble, one node per zone (round-robin when az_count > 3), at fixed
# private addresses (locals.tf). Debian's zookeeper package (3.8), data on the root volume:
# ZooKeeper holds only metadata.

resource "aws_instance" "zookeeper" {
  count = local.zookeeper_count

  ami                         = local.ami_id
  instance_type               = var.zookeeper_instance_type
  subnet_id                   = aws_subnet.private[count.index % var.az_count].id
  private_ip                  = local.zookeeper_ips[count.index]
  vpc_security_group_ids      = [aws_security_group.zookeeper.id]
  iam_instance_profile        = aws_iam_instance_profile.zookeeper.name
  associate_public_ip_address = false
  monitoring                  = true
  ebs_optimized               = true

  user_data = templatefile("${path.module}/templates/zookeeper-cloud-init.yaml.tftpl", {
    zookeeper_id = count.index + 1
    zoo_cfg = templatefile("${path.module}/templates/zoo.cfg.tftpl", {
      client_port   = local.zookeeper_client_port
      peer_port     = local.zookeeper_peer_port
      election_port = local.zookeeper_leader_port
      servers       = local.zookeeper_ips
    })
  })

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "disabled"
  }

  root_block_device {
    volume_type           = "gp3"
    volume_size           = var.root_volume_size_gb
    encrypted             = true
    kms_key_id            = aws_kms_key.infra.arn
    delete_on_termination = true
  }

  dynamic "credit_specification" {
    for_each = startswith(var.zookeeper_instance_type, "t") ? ["unlimited"] : []

    content {
      cpu_credits = credit_specification.value
    }
  }

  tags = {
    Name             = "${var.name}-zookeeper-${count.index + 1}"
    "riverbed:role"  = "zookeeper"
    "riverbed:zk-id" = tostring(count.index + 1)
  }

  lifecycle {
    # A newer Debian AMI must not replace a running ensemble member: roll nodes by hand
    # (terraform apply -replace='aws_instance.zookeeper[0]', one at a time).
    # user_data: cloud-init runs it on the first boot only (see brokers.tf).
    ignore_changes = [ami, user_data]
  }

  depends_on = [aws_route.private_nat]
}
