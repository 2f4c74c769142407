"""Tests of the cloud providers behind costopt.cloud.CloudProvider."""
