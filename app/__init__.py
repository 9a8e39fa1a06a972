"""The application on top of the pipeline: the `store-rollout` command line."""
