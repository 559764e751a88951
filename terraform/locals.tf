locals {
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition
  azs        = slice(data.aws_availability_zones.available.names, 0, var.az_count)
  ami_id     = var.ami_id != null ? var.ami_id : data.aws_ami.debian.id

  # One /(prefix + subnet_newbits) per zone: private subnets take the first az_count blocks,
  # the public ones (NAT gateways only) the last az_count blocks.
  private_subnet_cidrs = [for i in range(var.az_count) : cidrsubnet(var.vpc_cidr, var.subnet_newbits, i)]
  public_subnet_cidrs = [
    for i in range(var.az_count) : cidrsubnet(var.vpc_cidr, var.subnet_newbits, pow(2, var.subnet_newbits) - 1 - i)
  ]

  # Fixed private addresses: ZooKeeper's server.N lines and the brokers' zookeeper.connect and
  # advertised.listeners are rendered before any instance exists (no dependency cycle), and a
  # replaced instance comes back at the same address. Node i goes to zone i % az_count.
  zookeeper_count = 3
  zookeeper_ips = [
    for i in range(local.zookeeper_count) : cidrhost(local.private_subnet_cidrs[i % var.az_count], 10 + floor(i / var.az_count))
  ]
  broker_ips = [
    for i in range(var.broker_count) : cidrhost(local.private_subnet_cidrs[i % var.az_count], 20 + floor(i / var.az_count))
  ]
  zookeeper_connect = "${join(",", [for ip in local.zookeeper_ips : "${ip}:${local.zookeeper_client_port}"])}${var.zookeeper_chroot}"
  bootstrap_servers = join(",", [for ip in local.broker_ips : "${ip}:${local.broker_port}"])

  broker_port           = 9092
  metrics_port          = 9308
  zookeeper_client_port = 2181
  zookeeper_peer_port   = 2888
  zookeeper_leader_port = 3888

  cold_tier_prefix     = trim(var.cold_tier_prefix, "/")
  cold_tier_url        = "s3://${aws_s3_bucket.cold_tier.id}/${local.cold_tier_prefix}"
  cold_tier_prefix_arn = "${aws_s3_bucket.cold_tier.arn}/${local.cold_tier_prefix}/*"

  # riverbed_package is a pip requirement (riverbed==0.1.0, an https:// wheel URL) or an s3://
  # URL of a wheel, which the brokers copy with their instance profile before installing it.
  package_from_s3 = startswith(var.riverbed_package, "s3://")
  package_s3_arn  = "arn:${local.partition}:s3:::${trimprefix(var.riverbed_package, "s3://")}"

  broker_log_dir = "/var/lib/riverbed/data"
}
