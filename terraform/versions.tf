terraform {
  # 1.5: `check` blocks and the provider features used here; below 2.0 until it is tried.
  required_version = ">= 1.5.0, < 2.0.0"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # 5.x: aws_vpc_security_group_{ingress,egress}_rule and the split aws_s3_bucket_* resources.
      version = ">= 5.40.0, < 6.0.0"
    }
  }
}
