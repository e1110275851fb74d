"""The parameter server: sharded embedding tables and dense weights with their optimizer state."""
