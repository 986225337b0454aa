"""What ORTModule does and when: debug options and logging, the ORTMODULE_* variables, the
fallback policy and its errors, what it refuses (compositions: DataParallel, FSDP), partial
acceleration."""
