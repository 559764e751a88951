# Two customer managed keys, both rotated yearly: one for the cold tier (the only key the brokers'
# role may use) and one for the infrastructure (EBS volumes, the flow log group).

data "aws_iam_policy_document" "kms_account_admin" {
  #checkov:skip=CKV_AWS_109:A key policy's Resource "*" means the key itself; this is AWS's default key policy statement, delegating access to the account's IAM policies.
  #checkov:skip=CKV_AWS_111:Same key-policy statement: "*" is the key itself, and only principals the account's IAM policies allow can use it.
  #checkov:skip=CKV_AWS_356:Same key-policy statement: a key policy can only name its own key, as "*".
  # The account's IAM policies decide who administers and uses the key (AWS's default key
  # policy); without this statement the key could become unmanageable.
  statement {
    sid       = "AccountIamPolicies"
    actions   = ["kms:*"]
    resources = ["*"]

    principals {
      type        = "AWS"
      identifiers = ["arn:${local.partition}:iam::${local.account_id}:root"]
    }
  }
}

resource "aws_kms_key" "cold_tier" {
  description             = "${var.name}: Riverbed cold tier (S3 SSE-KMS)"
  enable_key_rotation     = true
  deletion_window_in_days = var.kms_deletion_window_days
  policy                  = data.aws_iam_policy_document.kms_account_admin.json
}

resource "aws_kms_alias" "cold_tier" {
  name          = "alias/${var.name}-cold-tier"
  target_key_id = aws_kms_key.cold_tier.key_id
}

data "aws_iam_policy_document" "kms_infra" {
  source_policy_documents = [data.aws_iam_policy_document.kms_account_admin.json]

  # CloudWatch Logs encrypts the flow log group with the key, for that log group only.
  statement {
    sid = "CloudWatchLogsFlowLogGroup"
    actions = [
      "kms:Encrypt",
      "kms:Decrypt",
      "kms:ReEncrypt*",
      "kms:GenerateDataKey*",
      "kms:Describe*",
    ]
    resources = ["*"]

    principals {
      type        = "Service"
      identifiers = ["logs.${var.region}.amazonaws.com"]
    }

    condition {
      test     = "ArnEquals"
      variable = "kms:EncryptionContext:aws:logs:arn"
      values   = ["arn:${local.partition}:logs:${var.region}:${local.account_id}:log-group:/riverbed/${var.name}/vpc-flow-logs"]
    }
  }
}

resource "aws_kms_key" "infra" {
  description             = "${var.name}: Riverbed EBS volumes and logs"
  enable_key_rotation     = true
  deletion_window_in_days = var.kms_deletion_window_days
  policy                  = data.aws_iam_policy_document.kms_infra.json
}

resource "aws_kms_alias" "infra" {
  name          = "alias/${var.name}-infra"
  target_key_id = aws_kms_key.infra.key_id
}
