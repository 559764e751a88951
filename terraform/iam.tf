# Least privilege: the brokers may read, write and delete objects under the cold-tier prefix
# only, list only that prefix, and use only the cold-tier key, only through S3. ZooKeeper
# needs no AWS API at all: its role carries no policy (it exists for CKV2_AWS_41 and so that
# Session Manager or CloudWatch agent permissions have a place to go).

data "aws_iam_policy_document" "ec2_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "broker" {
  name_prefix        = "${var.name}-broker-"
  description        = "Riverbed brokers: cold tier objects under s3://${aws_s3_bucket.cold_tier.id}/${local.cold_tier_prefix}/"
  assume_role_policy = data.aws_iam_policy_document.ec2_assume.json
}

data "aws_iam_policy_document" "broker" {
  # put, put_if_absent (If-None-Match), get/ranged get, head, delete; multipart upload and abort.
  statement {
    sid = "ColdTierObjects"
    actions = [
      "s3:GetObject",
      "s3:PutObject",
      "s3:DeleteObject",
      "s3:AbortMultipartUpload",
      "s3:ListMultipartUploadParts",
    ]
    resources = [local.cold_tier_prefix_arn]
  }

  # ListObjectsV2, only with a Prefix inside the cold tier.
  statement {
    sid       = "ColdTierList"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.cold_tier.arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${local.cold_tier_prefix}/*"]
    }
  }

  # ListMultipartUploads (abort_unfinished at startup). S3 has no prefix condition key for it, so
  # it covers the bucket; it lists upload ids and keys, never data.
  statement {
    sid       = "ColdTierListUploads"
    actions   = ["s3:ListBucketMultipartUploads"]
    resources = [aws_s3_bucket.cold_tier.arn]
  }

  # SSE-KMS: data keys for uploads (GenerateDataKey) and reads and multipart completion (Decrypt).
  statement {
    sid       = "ColdTierKey"
    actions   = ["kms:GenerateDataKey", "kms:Decrypt"]
    resources = [aws_kms_key.cold_tier.arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${var.region}.amazonaws.com"]
    }
  }

  # The riverbed wheel, when riverbed_package is an s3:// URL: that one object, read only.
  dynamic "statement" {
    for_each = local.package_from_s3 ? [local.package_s3_arn] : []

    content {
      sid       = "RiverbedWheel"
      actions   = ["s3:GetObject"]
      resources = [statement.value]
    }
  }
}

resource "aws_iam_role_policy" "broker" {
  name   = "cold-tier"
  role   = aws_iam_role.broker.id
  policy = data.aws_iam_policy_document.broker.json
}

resource "aws_iam_instance_profile" "broker" {
  name_prefix = "${var.name}-broker-"
  role        = aws_iam_role.broker.name
}

resource "aws_iam_role" "zookeeper" {
  name_prefix        = "${var.name}-zk-"
  description        = "Riverbed ZooKeeper nodes: no AWS permissions"
  assume_role_policy = data.aws_iam_policy_document.ec2_assume.json
}

resource "aws_iam_instance_profile" "zookeeper" {
  name_prefix = "${var.name}-zk-"
  role        = aws_iam_role.zookeeper.name
}

# VPC flow logs write to their own log group only.
data "aws_iam_policy_document" "flow_logs_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["vpc-flow-logs.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
  }
}

resource "aws_iam_role" "flow_logs" {
  name_prefix        = "${var.name}-flow-logs-"
  description        = "VPC flow logs of ${var.name} into CloudWatch Logs"
  assume_role_policy = data.aws_iam_policy_document.flow_logs_assume.json
}

data "aws_iam_policy_document" "flow_logs" {
  statement {
    actions = [
      "logs:CreateLogStream",
      "logs:PutLogEvents",
      "logs:DescribeLogStreams",
    ]
    resources = ["${aws_cloudwatch_log_group.flow_logs.arn}:*"]
  }
}

resource "aws_iam_role_policy" "flow_logs" {
  name   = "flow-logs"
  role   = aws_iam_role.flow_logs.id
  policy = data.aws_iam_policy_document.flow_logs.json
}
