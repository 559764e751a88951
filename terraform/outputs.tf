output "bootstrap_servers" {
  description = "Kafka bootstrap servers (private addresses, plaintext listener): host:9092,..."
  value       = local.bootstrap_servers
}

output "zookeeper_connect" {
  description = "ZooKeeper connect string of the ensemble (the brokers' zookeeper.connect)."
  value       = local.zookeeper_connect
}

output "cold_tier_bucket" {
  description = "Name of the cold-tier S3 bucket."
  value       = aws_s3_bucket.cold_tier.id
}

output "cold_tier_url" {
  description = "The brokers' remote.storage.url (s3://bucket/prefix)."
  value       = local.cold_tier_url
}

output "cold_tier_kms_key_arn" {
  description = "ARN of the KMS key encrypting the cold tier."
  value       = aws_kms_key.cold_tier.arn
}

output "broker_role_arn" {
  description = "ARN of the brokers' IAM role (cold-tier access)."
  value       = aws_iam_role.broker.arn
}

output "broker_instance_ids" {
  description = "EC2 instance ids of the brokers, in broker.id order (1..N)."
  value       = aws_instance.broker[*].id
}

output "zookeeper_instance_ids" {
  description = "EC2 instance ids of the ZooKeeper nodes, in myid order (1..3)."
  value       = aws_instance.zookeeper[*].id
}

output "vpc_id" {
  description = "ID of the VPC."
  value       = aws_vpc.main.id
}

output "private_subnet_ids" {
  description = "IDs of the private subnets, one per availability zone (for clients placed in the VPC)."
  value       = aws_subnet.private[*].id
}

output "broker_security_group_id" {
  description = "Security group of the brokers."
  value       = aws_security_group.broker.id
}
