package device

// ContextMemory is implemented by devices that know how much device memory
// their context took when it was created: the CUDA context's own
// allocations, which nvidia-smi counts against the process but no
// allocation of memwall's made. Budgets that mean "the process's whole
// footprint" subtract it (see residency.PlanBudget).
type ContextMemory interface {
	// ContextBytes returns the context's bytes and how they were found;
	// ok is false when they are unknown (how then says why).
	ContextBytes() (bytes uint64, how string, ok bool)
}

// FreeAfterContext is implemented by devices that recorded their free
// memory just after the context was created, so that what the process took
// since (kernel modules, library handles) can be counted: that figure less
// the free memory now.
type FreeAfterContext interface {
	FreeAfterContext() (bytes uint64, ok bool)
}
