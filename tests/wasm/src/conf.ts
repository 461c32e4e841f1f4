// The plugin's configuration, read with the SDK's get_buffer_bytes. The SDK's own
// RootContext.onConfigure (@solo-io/proxy-runtime 0.1.8) passes the configuration's size where
// the ABI wants a pointer to write the size to: the configuration comes back empty and the host
// writes into the module's memory at that address. The modules therefore override onConfigure
// without calling it.
import { get_buffer_bytes, BufferTypeValues } from "@solo-io/proxy-runtime/runtime";

export function readConfiguration(size: u32): string {
  if (size == 0) return "";
  return String.UTF8.decode(get_buffer_bytes(BufferTypeValues.PluginConfiguration, 0, size));
}
