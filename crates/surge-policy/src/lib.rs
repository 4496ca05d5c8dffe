//! surge-policy (to be written)
