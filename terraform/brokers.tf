# N brokers (broker.id 1..N) round-robin over the zones, broker.rack = the zone, each with its
# own gp3 hot-tier volume. The volume is a separate resource so it outlives the instance: a
# replaced broker (new AMI, new instance type) comes back with its partitions.

resource "aws_ebs_volume" "hot_tier" {
  # Not in an AWS Backup plan on purpose (checkov's CKV2_AWS_9, which 3.3.30 does not report
  # here): partitions are replicated 3x across zones and sealed segments are in S3; a snapshot
  # of a live log is not consistent, and restoring one would serve stale data as a replica.
  count = var.broker_count

  availability_zone = local.azs[count.index % var.az_count]
  type              = "gp3"
  size              = var.hot_tier_volume_size_gb
  iops              = var.hot_tier_volume_iops
  throughput        = var.hot_tier_volume_throughput
  encrypted         = true
  kms_key_id        = aws_kms_key.infra.arn

  tags = {
    Name                 = "${var.name}-broker-${count.index + 1}-hot-tier"
    "riverbed:role"      = "hot-tier"
    "riverbed:broker-id" = tostring(count.index + 1)
  }

  lifecycle {
    precondition {
      condition     = var.hot_tier_volume_iops <= 500 * var.hot_tier_volume_size_gb
      error_message = "gp3 allows at most 500 IOPS per GiB: raise hot_tier_volume_size_gb or lower hot_tier_volume_iops."
    }
    precondition {
      condition     = var.hot_tier_volume_throughput * 4 <= var.hot_tier_volume_iops
      error_message = "gp3 allows at most 0.25 MiB/s per provisioned IOPS: raise hot_tier_volume_iops or lower hot_tier_volume_throughput."
    }
  }
}

locals {
  broker_properties = [
    for i in range(var.broker_count) : templatefile("${path.module}/templates/broker.properties.tftpl", {
      broker_id          = i + 1
      rack               = local.azs[i % var.az_count]
      broker_port        = local.broker_port
      advertised_host    = local.broker_ips[i]
      log_dir            = local.broker_log_dir
      zookeeper_connect  = local.zookeeper_connect
      num_partitions     = var.num_partitions
      # In the instance's user data, readable to principals allowed
      # ec2:DescribeInstanceAttribute in this account (docs/terraform.md).
      zookeeper_digest_password = var.zookeeper_digest_password
      auto_create_topics = var.auto_create_topics
      cold_tier_url      = local.cold_tier_url
      region             = var.region
      metrics_port       = local.metrics_port
    })
  ]
}

resource "aws_instance" "broker" {
  count = var.broker_count

  ami                         = local.ami_id
  instance_type               = var.broker_instance_type
  subnet_id                   = aws_subnet.private[count.index % var.az_count].id
  private_ip                  = local.broker_ips[count.index]
  vpc_security_group_ids      = [aws_security_group.broker.id]
  iam_instance_profile        = aws_iam_instance_profile.broker.name
  associate_public_ip_address = false
  monitoring                  = true
  ebs_optimized               = true

  user_data = templatefile("${path.module}/templates/broker-cloud-init.yaml.tftpl", {
    broker_id        = count.index + 1
    properties       = local.broker_properties[count.index]
    volume_id        = aws_ebs_volume.hot_tier[count.index].id
    data_mount       = "/var/lib/riverbed"
    log_dir          = local.broker_log_dir
    riverbed_package = var.riverbed_package
    package_from_s3  = local.package_from_s3
    region           = var.region
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

  tags = {
    Name                 = "${var.name}-broker-${count.index + 1}"
    "riverbed:role"      = "broker"
    "riverbed:broker-id" = tostring(count.index + 1)
  }

  lifecycle {
    # cloud-init runs user_data on the first boot only, so a changed rendering would just
    # stop and start every broker at once. Roll changes one broker at a time instead:
    # terraform apply -replace='aws_instance.broker[0]' (docs/terraform.md).
    ignore_changes = [ami, user_data]
  }

  # The brokers' first start needs ZooKeeper, the cold tier bucket with its policy, and the
  # NAT route for apt and pip.
  depends_on = [
    aws_instance.zookeeper,
    aws_s3_bucket_policy.cold_tier,
    aws_s3_bucket_server_side_encryption_configuration.cold_tier,
    aws_iam_role_policy.broker,
    aws_route.private_nat,
  ]
}

resource "aws_volume_attachment" "hot_tier" {
  count = var.broker_count

  device_name = "/dev/sdf"
  volume_id   = aws_ebs_volume.hot_tier[count.index].id
  instance_id = aws_instance.broker[count.index].id

  # Stop the broker's instance (a clean shutdown of riverbed-broker) before detaching.
  stop_instance_before_detaching = true
}
