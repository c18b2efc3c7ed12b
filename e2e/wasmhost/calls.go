package wasmhost

import (
	"context"
	"sync/atomic"

	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
)

// Calls counts how often the module calls one of its own functions, named
// as in its name section (".runtime.mallocgc" for the Go heap's
// allocator): what a change costs inside the VM, where no wall clock on
// these machines resolves it.
type Calls struct{ n atomic.Int64 }

// Load returns the count so far.
func (c *Calls) Load() int64 { return c.n.Load() }

// NewCounting is New with every call of the function named fn counted. Its
// module is compiled apart, since the listener is compiled in.
func NewCounting(ctx context.Context, wasm []byte, semantics Semantics, fn string) (*Host, *Calls, error) {
	c := &Calls{}
	ctx = experimental.WithFunctionListenerFactory(ctx, counter{fn, c})
	h, err := newHost(ctx, wasm, semantics, false)
	return h, c, err
}

type counter struct {
	fn    string
	calls *Calls
}

func (f counter) NewFunctionListener(def api.FunctionDefinition) experimental.FunctionListener {
	if def.DebugName() != f.fn {
		return nil
	}
	return f
}

func (f counter) Before(context.Context, api.Module, api.FunctionDefinition, []uint64, experimental.StackIterator) {
	f.calls.n.Add(1)
}

func (counter) After(context.Context, api.Module, api.FunctionDefinition, []uint64) {}

func (counter) Abort(context.Context, api.Module, api.FunctionDefinition, error) {}
