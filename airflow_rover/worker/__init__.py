"""The TensorFlow training runtime: shard-fed input, PS-backed embeddings, reference models."""
