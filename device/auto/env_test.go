package auto

import (
	"testing"

	"github.com/memwall/memwall/device/cpu"
)

func TestCPUFromEnv(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	o, err := CPUFromEnv(env(nil))
	if err != nil || o.Pages != cpu.PagesPopulate || o.Workers != 0 {
		t.Fatalf("empty environment: %+v, %v", o, err)
	}
	o, err = CPUFromEnv(env(map[string]string{EnvCPUPages: "lazy", EnvCPUWorkers: "7"}))
	if err != nil || o.Pages != cpu.PagesLazy || o.Workers != 7 {
		t.Fatalf("lazy, 7: %+v, %v", o, err)
	}
	for _, bad := range []map[string]string{
		{EnvCPUPages: "sometimes"}, {EnvCPUWorkers: "0"}, {EnvCPUWorkers: "-3"}, {EnvCPUWorkers: "4097"}, {EnvCPUWorkers: "8x"},
	} {
		if _, err := CPUFromEnv(env(bad)); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
