package fleet_test

// The module-wide -long flag, so that `go test ./... -long` runs here.
import _ "github.com/memwall/memwall/internal/longtest"
