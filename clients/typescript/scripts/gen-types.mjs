// `npm run gen:types`: payonce's OpenAPI document (clients/openapi.json) -> src/schema.ts.
//
//   node scripts/gen-types.mjs [input.json] [output.ts]
//
// The one place the generator's options live, so the drift test (tests/clients/test_typescript_client.py)
// produces exactly what is checked in. Build tooling: Node-only, never part of the package.
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import openapiTS, { astToString, COMMENT_HEADER } from "openapi-typescript";

const here = (path) => fileURLToPath(new URL(path, import.meta.url));
const [input = here("../../openapi.json"), output = here("../src/schema.ts")] = process.argv.slice(2);

const document = JSON.parse(readFileSync(input, "utf8"));
const ast = await openapiTS(document, {
  // A field with a default is optional in a request (`policy.attempts_per_model`), not required.
  defaultNonNullable: false,
  silent: true,
});
writeFileSync(output, `${COMMENT_HEADER}${astToString(ast)}`, "utf8");
