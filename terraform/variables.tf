# Validation conditions reference only their own variable (Terraform before 1.9 allows no other)
# and stick to the functions tests/deploy/test_terraform.py can evaluate: it checks every default
# and every value in terraform.tfvars.example against them, and a bad value against each.

variable "region" {
  description = "AWS region to deploy into, e.g. eu-west-1."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}(-gov|-iso[a-z]*)?-[a-z]+-[0-9]$", var.region))
    error_message = "region must be an AWS region name such as eu-west-1."
  }
}

variable "name" {
  description = "Cluster name: prefixes every resource name and tags everything (riverbed:cluster)."
  type        = string
  default     = "riverbed"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,19}$", var.name))
    error_message = "name must be 2-20 characters of lowercase letters, digits and '-', starting with a letter (it becomes part of an S3 bucket name)."
  }
}

variable "tags" {
  description = "Extra tags for every resource (merged into the provider's default_tags)."
  type        = map(string)
  default     = {}
}

variable "vpc_cidr" {
  description = "CIDR block of the new VPC. Between /16 and /22 so each zone's subnet has room for the fixed ZooKeeper and broker addresses."
  type        = string
  default     = "10.42.0.0/16"

  validation {
    condition     = can(cidrhost(var.vpc_cidr, 0)) && can(regex("^[0-9.]+/(1[6-9]|2[0-2])$", var.vpc_cidr))
    error_message = "vpc_cidr must be a valid IPv4 CIDR block between /16 and /22, e.g. 10.42.0.0/16."
  }
}

variable "subnet_newbits" {
  description = "Bits added to the VPC prefix for each subnet (4: a /16 VPC gets /20 subnets). The VPC holds 2^subnet_newbits subnets; 2 * az_count are used."
  type        = number
  default     = 4

  validation {
    condition     = var.subnet_newbits >= 3 && var.subnet_newbits <= 6 && floor(var.subnet_newbits) == var.subnet_newbits
    error_message = "subnet_newbits must be an integer from 3 to 6."
  }
}

variable "az_count" {
  description = "Availability zones to spread over: one private subnet (and one NAT gateway subnet) each. At least 3, so that losing one zone keeps a ZooKeeper quorum and 2 of 3 replicas."
  type        = number
  default     = 3

  validation {
    condition     = var.az_count >= 3 && var.az_count <= 6 && floor(var.az_count) == var.az_count
    error_message = "az_count must be an integer from 3 to 6."
  }
}

variable "availability_zones" {
  description = "Zone names to use, in order (e.g. [\"eu-west-1a\", \"eu-west-1b\", \"eu-west-1c\"]); the first az_count are used. null: the region's zones <region>a to <region>f that exist, in name order. Pinning them keeps the layout fixed whatever AWS adds."
  type        = list(string)
  default     = null

  validation {
    condition     = var.availability_zones == null || (length(var.availability_zones) >= 3 && alltrue([for z in var.availability_zones : can(regex("^[a-z]{2}(-gov|-iso[a-z]*)?-[a-z]+-[0-9][a-z]$", z))]))
    error_message = "availability_zones must be null or at least 3 zone names such as eu-west-1a."
  }
}

variable "single_nat_gateway" {
  description = "One NAT gateway for all zones (cheaper; a zone outage cuts the other zones' package downloads) instead of one per zone."
  type        = bool
  default     = false
}

variable "allowed_cidrs" {
  description = "CIDR blocks outside the VPC (peered networks, VPN) allowed to reach the brokers' Kafka port 9092. The VPC itself is always allowed. Never 0.0.0.0/0: the listener is plaintext and unauthenticated."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.allowed_cidrs : can(cidrhost(c, 0)) && !endswith(c, "/0")])
    error_message = "allowed_cidrs must hold valid CIDR blocks, none of them /0 (0.0.0.0/0 or ::/0)."
  }
}

variable "broker_count" {
  description = "Number of brokers (broker.id 1..N), spread round-robin over the zones. At least 3: topics are created with replication factor 3 and min.insync.replicas 2."
  type        = number
  default     = 3

  validation {
    condition     = var.broker_count >= 3 && var.broker_count <= 48 && floor(var.broker_count) == var.broker_count
    error_message = "broker_count must be an integer from 3 (replication factor 3) to 48."
  }
}

variable "broker_instance_type" {
  description = "EC2 instance type of the brokers (x86_64: the AMI is Debian 12 amd64)."
  type        = string
  default     = "m6i.large"

  validation {
    condition     = length(trimspace(var.broker_instance_type)) > 0 && can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", var.broker_instance_type))
    error_message = "broker_instance_type must be a non-empty instance type such as m6i.large."
  }
}

variable "zookeeper_instance_type" {
  description = "EC2 instance type of the 3 ZooKeeper nodes. Burstable (t*) types run with unlimited CPU credits so a busy ZooKeeper is never throttled."
  type        = string
  default     = "t3.medium"

  validation {
    condition     = length(trimspace(var.zookeeper_instance_type)) > 0 && can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", var.zookeeper_instance_type))
    error_message = "zookeeper_instance_type must be a non-empty instance type such as t3.medium."
  }
}

variable "ami_id" {
  description = "AMI for all instances. null: the newest Debian 12 amd64 AMI published by Debian. Any replacement must be Debian 12 based (the cloud-init installs python3.11 and zookeeper with apt)."
  type        = string
  default     = null

  validation {
    condition     = var.ami_id == null || can(regex("^ami-[0-9a-f]{8,17}$", var.ami_id))
    error_message = "ami_id must be null or an AMI id such as ami-0123456789abcdef0."
  }
}

variable "root_volume_size_gb" {
  description = "Size of each instance's root volume (gp3, encrypted), in GiB."
  type        = number
  default     = 20

  validation {
    condition     = var.root_volume_size_gb >= 8 && var.root_volume_size_gb <= 1024
    error_message = "root_volume_size_gb must be from 8 to 1024."
  }
}

variable "hot_tier_volume_size_gb" {
  description = "Size of each broker's hot-tier EBS volume (gp3, encrypted, mounted at /var/lib/riverbed), in GiB."
  type        = number
  default     = 500

  validation {
    condition     = var.hot_tier_volume_size_gb >= 10 && var.hot_tier_volume_size_gb <= 16384 && floor(var.hot_tier_volume_size_gb) == var.hot_tier_volume_size_gb
    error_message = "hot_tier_volume_size_gb must be an integer from 10 to 16384 (gp3's range)."
  }
}

variable "hot_tier_volume_iops" {
  description = "Provisioned IOPS of each hot-tier gp3 volume (3000 are included in gp3's price). At most 500 per GiB of hot_tier_volume_size_gb."
  type        = number
  default     = 3000

  validation {
    condition     = var.hot_tier_volume_iops >= 3000 && var.hot_tier_volume_iops <= 16000 && floor(var.hot_tier_volume_iops) == var.hot_tier_volume_iops
    error_message = "hot_tier_volume_iops must be an integer from 3000 to 16000."
  }
}

variable "hot_tier_volume_throughput" {
  description = "Provisioned throughput of each hot-tier gp3 volume, in MiB/s (125 are included in gp3's price). At most hot_tier_volume_iops / 4."
  type        = number
  default     = 250

  validation {
    condition     = var.hot_tier_volume_throughput >= 125 && var.hot_tier_volume_throughput <= 1000 && floor(var.hot_tier_volume_throughput) == var.hot_tier_volume_throughput
    error_message = "hot_tier_volume_throughput must be an integer from 125 to 1000 MiB/s."
  }
}

variable "riverbed_package" {
  description = "What the brokers pip-install: a pip requirement (riverbed==0.1.0, or an https:// URL of a wheel on an index you control) or the s3:// URL of a wheel (s3://my-artifacts/riverbed-0.1.0-cp311-cp311-linux_x86_64.whl), which the brokers' role may then read (that object only). No whitespace or quotes."
  type        = string

  validation {
    condition     = can(regex("^[^\\s'\"`$\\\\;&|<>]+$", var.riverbed_package)) && (!startswith(var.riverbed_package, "s3://") || can(regex("^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/.+\\.whl$", var.riverbed_package)))
    error_message = "riverbed_package must be a pip requirement or wheel URL without whitespace, quotes or shell metacharacters; an s3:// one must be s3://bucket/path/name.whl."
  }
}

variable "cold_tier_bucket_name" {
  description = "Name of the cold-tier S3 bucket. null: a unique name starting with \"<name>-cold-tier-\"."
  type        = string
  default     = null

  validation {
    condition     = var.cold_tier_bucket_name == null || can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.cold_tier_bucket_name))
    error_message = "cold_tier_bucket_name must be null or a valid S3 bucket name (3-63 lowercase letters, digits, '.' and '-')."
  }
}

variable "cold_tier_prefix" {
  description = "Key prefix of the cold tier inside the bucket (remote.storage.url = s3://bucket/prefix). The brokers' role can touch only keys under it."
  type        = string
  default     = "riverbed"

  validation {
    condition     = can(regex("^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$", var.cold_tier_prefix))
    error_message = "cold_tier_prefix must be one or more '/'-separated parts of letters, digits, '.', '_' and '-', without leading or trailing '/' and no part starting with '.'."
  }
}

variable "abort_incomplete_multipart_days" {
  description = "Days after which the bucket's lifecycle rule aborts a multipart upload that was never completed (a broker that died mid-upload). Riverbed uploads take minutes, so 1-2 days is plenty."
  type        = number
  default     = 2

  validation {
    condition     = var.abort_incomplete_multipart_days >= 1 && var.abort_incomplete_multipart_days <= 30 && floor(var.abort_incomplete_multipart_days) == var.abort_incomplete_multipart_days
    error_message = "abort_incomplete_multipart_days must be an integer from 1 to 30."
  }
}

variable "noncurrent_version_retention_days" {
  description = "Versioning is on: an object Riverbed deletes (retention, compaction, orphans) or overwrites stays recoverable as a noncurrent version for this many days, then the lifecycle rule removes it. It is also how long deleted data keeps costing storage."
  type        = number
  default     = 7

  validation {
    condition     = var.noncurrent_version_retention_days >= 1 && var.noncurrent_version_retention_days <= 365 && floor(var.noncurrent_version_retention_days) == var.noncurrent_version_retention_days
    error_message = "noncurrent_version_retention_days must be an integer from 1 to 365."
  }
}

variable "access_log_bucket" {
  description = "Existing bucket that receives the cold-tier bucket's server access logs (it must allow logging.s3.amazonaws.com to write). null: no access logging."
  type        = string
  default     = null

  validation {
    condition     = var.access_log_bucket == null || can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.access_log_bucket))
    error_message = "access_log_bucket must be null or a valid S3 bucket name."
  }
}

variable "log_retention_days" {
  description = "Retention of the VPC flow log group in CloudWatch Logs, in days (one of CloudWatch's allowed values)."
  type        = number
  default     = 365

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days must be one of CloudWatch Logs' retention values (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653)."
  }
}

variable "kms_deletion_window_days" {
  description = "Waiting period before a destroyed KMS key is deleted (the data it encrypted is unreadable after that)."
  type        = number
  default     = 30

  validation {
    condition     = var.kms_deletion_window_days >= 7 && var.kms_deletion_window_days <= 30 && floor(var.kms_deletion_window_days) == var.kms_deletion_window_days
    error_message = "kms_deletion_window_days must be an integer from 7 to 30."
  }
}

variable "auto_create_topics" {
  description = "Broker setting auto.create.topics.enable: create unknown topics on first use. Off by default, as a typo in a producer's topic name would otherwise create a topic."
  type        = bool
  default     = false
}

variable "num_partitions" {
  description = "Broker setting num.partitions: partitions of topics created without a count."
  type        = number
  default     = 6

  validation {
    condition     = var.num_partitions >= 1 && floor(var.num_partitions) == var.num_partitions
    error_message = "num_partitions must be a positive integer."
  }
}

variable "zookeeper_chroot" {
  description = "ZooKeeper path under which Riverbed keeps its tree (the chroot of zookeeper.connect), so the ensemble can serve other systems without their trees meeting."
  type        = string
  default     = "/riverbed"

  validation {
    condition     = can(regex("^(/[A-Za-z0-9._-]+)+$", var.zookeeper_chroot))
    error_message = "zookeeper_chroot must be an absolute ZooKeeper path such as /riverbed."
  }
}

variable "zookeeper_digest_password" {
  description = "Password of the ZooKeeper digest user `riverbed`: every znode the brokers create is readable and writable with it only (zookeeper.set.acl). Generate one, e.g. `openssl rand -base64 32`."
  type        = string
  sensitive   = true

  validation {
    condition     = can(regex("^\\S{16,}$", var.zookeeper_digest_password))
    error_message = "zookeeper_digest_password must be at least 16 characters, without spaces."
  }
}
