//! surge-nbd (to be written)
