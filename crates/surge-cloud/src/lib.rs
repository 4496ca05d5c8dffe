//! surge-cloud (to be written)
