import { defineConfig } from "vitest/config";

// The tests import the BUILT package (../dist/index.js): `npm run build` first (the pytest wrapper does).
// Integration tests talk to a real payonce stack that tests/clients/test_typescript_client.py starts and
// names in PAYONCE_TEST_* variables; without them they fail, saying so.
export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 45_000,
    hookTimeout: 45_000,
    reporters: ["verbose"],
  },
});
