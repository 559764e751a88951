provider "aws" {
  region = var.region

  default_tags {
    tags = merge(var.tags, {
      "riverbed:cluster" = var.name
      "managed-by"       = "terraform"
    })
  }
}

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

# A closed set of zone names (CKV_AWS_394): availability_zones when given, else the region's
# standard zones <region>a..f. No state filter: a zone that is impaired for a while must not
# drop out of the list and shift every subnet to another zone on the next plan.
data "aws_availability_zones" "available" {
  filter {
    name   = "zone-name"
    values = var.availability_zones != null ? var.availability_zones : [for letter in ["a", "b", "c", "d", "e", "f"] : "${var.region}${letter}"]
  }

  # Local Zones and Wavelength Zones lack gp3 or m6i in places: regular zones only.
  filter {
    name   = "opt-in-status"
    values = ["opt-in-not-required"]
  }
}

# Debian 12 (bookworm): python3.11 and ZooKeeper 3.8 are Debian packages there, the same ones
# the project's own Makefile installs. Owner 136693071363 is Debian's cloud team.
data "aws_ami" "debian" {
  most_recent = true
  owners      = ["136693071363"]

  filter {
    name   = "name"
    values = ["debian-12-amd64-*"]
  }

  filter {
    name   = "architecture"
    values = ["x86_64"]
  }

  filter {
    name   = "virtualization-type"
    values = ["hvm"]
  }
}
