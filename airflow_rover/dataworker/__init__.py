"""GoldMiner's data worker: reads the rows of the shards trainers leased, preprocesses them and
serves ready batches (``docs/data-workers.md``)."""
