;; A proxy-wasm module whose request callback grows its memory until refused: the memory
;; limit must end it (a refused grow traps rather than returning -1 and going on).
(module
  (memory (export "memory") 1)
  (func (export "proxy_abi_version_0_2_0"))
  (func (export "proxy_on_memory_allocate") (param i32) (result i32) (i32.const 1024))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (loop $more
      (br_if $more (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))
    (i32.const 0)))
