"""The call pipeline: stages, queues and the primitives that keep barge-in consistent."""
