# The cold tier: one bucket, private, SSE-KMS, TLS only, versioned with a short noncurrent
# window, incomplete multipart uploads aborted by lifecycle (Riverbed aborts its own failed
# uploads, but not those of a broker that died mid-upload: docs/tiering.md).

resource "aws_s3_bucket" "cold_tier" {
  #checkov:skip=CKV_AWS_144:Cross-region replication doubles storage cost; the data is already replicated 3x across AZs by S3 and re-creatable only from the brokers. Add aws_s3_bucket_replication if a region-loss RPO is required.
  #checkov:skip=CKV2_AWS_62:No consumer for S3 event notifications; Riverbed finds its objects through its own manifests.
  bucket        = var.cold_tier_bucket_name
  bucket_prefix = var.cold_tier_bucket_name == null ? "${var.name}-cold-tier-" : null

  # A destroy must not silently take the cold tier with it: empty the bucket by hand first.
  force_destroy = false

  tags = { Name = "${var.name}-cold-tier" }
}

resource "aws_s3_bucket_ownership_controls" "cold_tier" {
  bucket = aws_s3_bucket.cold_tier.id

  rule {
    # ACLs off: the bucket policy and IAM decide access, every object belongs to the account.
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "cold_tier" {
  bucket = aws_s3_bucket.cold_tier.id

  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

# SSE-KMS with a customer managed key (not SSE-S3/AES256): key use is logged in CloudTrail, the key
# policy and the role's kms: permissions are a second gate beside the bucket policy, and access
# can be cut off by disabling the key. The bucket key keeps KMS requests (and their cost) low.
resource "aws_s3_bucket_server_side_encryption_configuration" "cold_tier" {
  bucket = aws_s3_bucket.cold_tier.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.cold_tier.arn
    }
    bucket_key_enabled = true
  }
}

# Versioning on: the brokers' role may delete under the prefix, so a bug or a compromised broker
# could wipe the cold tier; deleted objects stay recoverable for noncurrent_version_retention_days.
# Riverbed's conditional creates (If-None-Match: *) work on versioned buckets.
resource "aws_s3_bucket_versioning" "cold_tier" {
  bucket = aws_s3_bucket.cold_tier.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "cold_tier" {
  bucket = aws_s3_bucket.cold_tier.id

  rule {
    id     = "abort-incomplete-multipart-uploads"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = var.abort_incomplete_multipart_days
    }
  }

  rule {
    id     = "expire-noncurrent-versions"
    status = "Enabled"

    filter {}

    noncurrent_version_expiration {
      noncurrent_days = var.noncurrent_version_retention_days
    }

    expiration {
      expired_object_delete_marker = true
    }
  }

  depends_on = [aws_s3_bucket_versioning.cold_tier]
}

data "aws_iam_policy_document" "cold_tier_bucket" {
  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.cold_tier.arn,
      "${aws_s3_bucket.cold_tier.arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }

  statement {
    sid     = "DenyOutdatedTls"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.cold_tier.arn,
      "${aws_s3_bucket.cold_tier.arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "NumericLessThan"
      variable = "s3:TlsVersion"
      values   = ["1.2"]
    }
  }
}

resource "aws_s3_bucket_policy" "cold_tier" {
  bucket = aws_s3_bucket.cold_tier.id
  policy = data.aws_iam_policy_document.cold_tier_bucket.json

  # A policy put before the public access block exists can race it.
  depends_on = [aws_s3_bucket_public_access_block.cold_tier]
}

resource "aws_s3_bucket_logging" "cold_tier" {
  count = var.access_log_bucket == null ? 0 : 1

  bucket        = aws_s3_bucket.cold_tier.id
  target_bucket = var.access_log_bucket
  target_prefix = "s3-access/${var.name}-cold-tier/"
}

# Access logging needs a bucket of your own (a log sink has its own retention and access rules,
# and S3 access logs cannot be written with SSE-KMS). Warn on every plan while it is off.
check "cold_tier_access_logging" {
  assert {
    condition     = var.access_log_bucket != null
    error_message = "The cold-tier bucket has no server access logging: set access_log_bucket (CloudTrail S3 data events are the other option)."
  }
}
