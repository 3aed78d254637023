// Node 20 provides the WebAssembly global, but @types/node 20 does not declare it and the DOM lib
// would bring browser globals into a server. These are the parts Arbiter and opa-wasm use.
declare namespace WebAssembly {
  class Module {
    constructor(bytes: ArrayBufferView | ArrayBuffer);
  }
  class Instance {
    constructor(module: Module, imports?: Record<string, unknown>);
    readonly exports: Record<string, unknown>;
  }
  interface MemoryDescriptor {
    initial: number;
    maximum?: number;
    shared?: boolean;
  }
  class Memory {
    constructor(descriptor: MemoryDescriptor);
    readonly buffer: ArrayBuffer;
    grow(delta: number): number;
  }
  interface WebAssemblyInstantiatedSource {
    instance: Instance;
    module: Module;
  }
  function compile(bytes: ArrayBufferView | ArrayBuffer): Promise<Module>;
}
