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
