"""The plan space: how a model is split over a cluster and scheduled."""
